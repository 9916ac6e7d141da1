# Notebook 07, exercise 1: one solution (it uses the notebook's names).
# The model is 64*64 + 64 + 64*10 + 10 = 4810 float32 values: 19240 bytes a push or a pull.
# Each rank takes ceil(N / (W * 32)) steps (the last one padded), a pull and a push each, and
# pulls the model once before the epoch and once after it.
def epoch_bytes(N, W):
    model_bytes = sum(int(np.prod(shape)) for shape in SHAPES.values()) * 4
    steps = -(-N // (W * 32))
    return W * steps * model_bytes, W * (steps + 2) * model_bytes


print("1400 images, 2 ranks:", epoch_bytes(1400, 2))
