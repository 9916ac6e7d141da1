# Notebook 10, exercise 1: one solution (it uses the notebook's names).
# 2 * (W - 1) steps (reduce-scatter, then all-gather), each sending one chunk of M / W bytes.
answer1 = 2 * (8 - 1) * M // 8
