# Notebook 10, exercise 2: one solution (it uses the notebook's names).
# In each phase (push, then pull) the busiest side is a server's, W messages and W * M / S
# bytes, or a worker's own, S messages and M bytes (its S slices), whichever is more; both
# maxima come from the same side, so each phase lasts max(W, S) * ALPHA + max(M, W * M / S) / B.
def ps_seconds(W, S):
    return 2 * (max(W, S) * ALPHA + max(M, W * M / S) / B)


print("W = 8, S = 2:", ps_seconds(8, 2), "s")
