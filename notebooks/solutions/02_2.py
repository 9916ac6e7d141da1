# Notebook 02, exercise 2: one solution (it uses the notebook's names).
# The residual grows 0.2, 0.4, 0.6: the third push reaches the threshold and sends 0.5.
answer2 = 3
