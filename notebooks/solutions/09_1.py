# Notebook 09, exercise 1: one solution (it uses the notebook's names).
answer1 = len(handle.workers())
