# Notebook 08, exercise 1: one solution (it uses the notebook's names).
# A fresh optimizer has no momentum: its first step is -learning_rate * gradient.
answer1 = -0.1 * 1.0
