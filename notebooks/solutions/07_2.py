# Notebook 07, exercise 2: one solution.
# set_to_none=False zeroes the server's .grad in place: the same tensor as the worker's p.grad,
# so each step sends one gradient. set_to_none=True drops the server's reference only: the
# worker's p.grad keeps adding up, and step 3 sends the sum of 3 steps' gradients.
answer2 = (1, 3)
