# Notebook 04, exercise 2: one solution (it uses the notebook's names).
# Each rank pushes and pulls M bytes per iteration; the S servers share them equally.
def per_server(W, S):
    M = EX_ELEMENTS * 4  # float32
    return 2 * M * W / S
