# Notebook 05b, exercise 1: one solution.
# (a) Rank 1's init only waits for the owner's (rank 0's) and its pull does not wait for
#     rank 0's push, 0.3 s later: it reads the owner's 10, not its own 20.
# (b) Rank 0 enters the barrier after its push, so rank 1's pull comes after it: 99.
answer1 = (10.0, 99.0)
