# Notebook 06, exercise 1: one solution (it uses the notebook's names).
data = {"x": np.arange(1000)}
padded = MinibatchSource(data, batch_size=32, rank=0, num_workers=6, prefetch=0)
dropped = MinibatchSource(data, batch_size=32, rank=0, num_workers=6, drop_last=True, prefetch=0)
answer1 = (len(padded), len(dropped))
