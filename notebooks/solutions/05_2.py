# Notebook 05, exercise 2: one solution. Rank 1 pushes for the first time 0.5 s in, and
# once more every 0.5 s; rank 0's pull after its k-th push needs every clock at k - s or
# more, so it waits whenever k - s >= 1: rank 1 is always behind rank 0's pushes.
def pulls_that_wait(s):
    return [k - s >= 1 for k in range(1, 5)]


print("staleness 2:", pulls_that_wait(2))
