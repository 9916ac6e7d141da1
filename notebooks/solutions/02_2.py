# Notebook 02, exercise 2: one solution (it uses the notebook's names).
# The residual grows by |g| a push (0.2, 0.4, 0.6 for g = 0.2): the first push that brings
# it to the threshold sends +-threshold, and the residual keeps the rest.
def pushes_to_send(g, threshold):
    return int(np.ceil(threshold / abs(g)))


print("pushes of 0.2, threshold 0.5:", pushes_to_send(0.2, 0.5))
