# Notebook 11, exercise 1: one solution (it uses the notebook's names).
# The push carries each table's rows touched, each once (np.unique): K float32 values and an
# int64 row number per row, sent to the server holding it.
touched = len(np.unique(users_in_batch)) + len(np.unique(items_in_batch))
answer1 = touched * (K * 4 + 8)
