# Notebook 05, exercise 2: one solution. Rank 1's clock stays 0 until its first push
# (0.5 s in); rank 0's pull after its k-th push needs every clock at k - 2 or more.
rank_1_clock = 0
answer2 = [k - 2 > rank_1_clock for k in range(1, 5)]
