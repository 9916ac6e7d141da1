# Notebook 12, exercise 1: one solution.
# The ring reduce-scatter takes W - 1 steps, in each of which a rank sends one chunk of
# n / W bytes to its right. The pairwise all-to-all takes W - 1 steps too, in each of which
# a rank sends one chunk of n / W bytes to another rank (its own chunk stays). The same
# bytes, (W - 1) / W * n: half of what a ring all-reduce sends.
def sent_per_rank(W, n):
    return (W - 1) * n / W, (W - 1) * n / W


print("W = 3, 48 KiB:", sent_per_rank(3, 48 << 10))
