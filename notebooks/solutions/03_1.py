# Notebook 03, exercise 1: one solution (it uses the notebook's names).
n, t, _ = results[-1]
answer1 = ((n + 1) * B + n * 2 * B) / t / 1e9
