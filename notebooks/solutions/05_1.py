# Notebook 05, exercise 1: one solution (it uses the notebook's names).
# dist_sync sums the W = 2 pushes of a round and calls the updater once per round:
# 10 rounds, 10 calls. dist_async calls it once per push: 2 ranks x 10 pushes.
answer1 = (10, 2 * 10)
