# Notebook 03, exercise 1: one solution (it uses the notebook's names).
# The push adds the 8 values into the key's stored array in place and each pull copies into
# the caller's array: no array is allocated (the peak is a few hundred bytes of Python objects).
answer1 = 0
