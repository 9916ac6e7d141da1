# Notebook 05, exercise 1: one solution (it uses the notebook's names).
# dist_sync sums the W pushes of a round and calls the updater once per round: `steps` calls.
# dist_async calls it once per push: W ranks x `steps` pushes.
def updater_calls(W, steps):
    return steps, W * steps


print("2 ranks, 10 steps:", updater_calls(2, 10))
