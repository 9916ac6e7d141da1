# Notebook 10, exercise 2: one solution (it uses the notebook's names).
# In each phase (push, then pull) the busiest link is a server's, W * M / S bytes, or a
# worker's own, M bytes (its S slices), whichever is more; each phase also pays ALPHA.
def ps_seconds(W, S):
    return 2 * (ALPHA + max(M, W * M / S) / B)


print("W = 8, S = 2:", ps_seconds(8, 2), "s")
