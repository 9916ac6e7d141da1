# Notebook 05b, exercise 1: one solution.
# (a) Rank 1's init only waits for the owner's (rank 0's) and its pull does not wait for
#     rank 0's push, 0.3 s later: it reads the owner's init, not its own.
# (b) Rank 0 enters the barrier after its push, so rank 1's pull comes after it: the push.
def flag_read_by_rank_1(inits, pushed):
    return inits[0], pushed


print("inits (10, 20), pushed 99:", flag_read_by_rank_1((10.0, 20.0), 99.0))
