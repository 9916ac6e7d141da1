# Notebook 10, exercise 2: one solution (it uses the notebook's names).
# Each server's link is the busiest: W * M / S bytes in during the push, out during the pull.
answer2 = 2 * (ALPHA + 8 * M / 2 / B)
