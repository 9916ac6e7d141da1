# Notebook 04, exercise 1: one solution (it uses the notebook's names).
# 15000 elements >= bigarray_bound: cut into 2 equal slices, one per server.
answer1 = 300 * 50 // 2
