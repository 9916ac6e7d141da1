# Notebook 04, exercise 2: one solution (it uses the notebook's names).
# Each rank pushes and pulls M bytes per iteration; the S servers share them equally.
M = EX_ELEMENTS * 4
answer2 = {(W, S): 2 * M * W / S for W, S in [(2, 1), (2, 2), (4, 2), (4, 4)]}
