*
j-2"no h100 free(