# Notebook 12, exercise 1: one solution.
# Both send every chunk but the rank's own. The ring passes on, in its W - 1 steps, the
# chunks rank - 1, rank - 2, ..., rank - W + 1 (mod W); the all-to-all sends chunk s to
# rank s for every s but rank. tensor_split gives the first N % W chunks of the N elements
# one element more than the others.
def sent_per_rank(W, n, rank):
    elements = n // 4
    own = elements // W + (1 if rank < elements % W else 0)
    return n - 4 * own, n - 4 * own


print("W = 3, 48 KiB, rank 0:", sent_per_rank(3, 48 << 10, 0))
