# Notebook 09, exercise 1: one solution (it uses the notebook's names).
# 3 servers dealt in turn to the 2 workers: servers 0 and 2 on the first, server 1 on the second.
workers = handle.workers()
answer1 = [len(range(i, 3, len(workers))) for i in range(len(workers))]
