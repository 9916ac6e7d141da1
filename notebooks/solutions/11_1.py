# Notebook 11, exercise 1: one solution (it uses the notebook's names).
# The push carries each table's rows touched, each once (np.unique): K float32 values and an
# int64 row number per row, sent to the server holding it.
def push_bytes(user_ids, item_ids):
    touched = len(np.unique(user_ids)) + len(np.unique(item_ids))
    return touched * (K * 4 + 8)


print("the batch above:", push_bytes(users_in_batch, items_in_batch), "bytes")
