:
step 10 loss 1.9
