# Notebook 06, exercise 2: one solution (it uses the notebook's names).
# [rank::size] reads every sample of the epoch; a partition reads its block, N / W samples
# (whole chunks of 50 when N / W is a multiple of 50).
def reads_per_rank(N, W, B):
    return N, N // W


print("N = 1200, W = 6, B = 20:", reads_per_rank(1200, 6, 20))
