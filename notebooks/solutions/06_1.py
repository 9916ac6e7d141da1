# Notebook 06, exercise 1: one solution (it uses the notebook's names).
# One step takes W x B samples: ceil(N / (W B)) steps padded, floor(N / (W B)) dropped.
def steps_per_rank(N, B, W):
    per_step = W * B
    return -(-N // per_step), N // per_step


print("1000 samples, batch 32, 6 ranks:", steps_per_rank(1000, 32, 6))
