# Notebook 06, exercise 2: one solution (it uses the notebook's names).
# [rank::size] reads every sample of the epoch; a partition reads N / W (whole chunks of 50).
answer2 = (1200, 1200 // 6)
