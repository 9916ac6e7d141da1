# Notebook 07, exercise 2: one solution (it uses the notebook's names).
# Step k pushes k from each rank; rescale_grad=1/W averages them to k: w = -0.1 * (1 + 2 + 3 + 4).
answer2 = -0.1 * (1 + 2 + 3 + 4)
