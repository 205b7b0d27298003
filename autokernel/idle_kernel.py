"""The judge's own kernel for the window floor (autokernel/timing.py): one tiny copy, so a window
of it is nothing but what every window costs (the pipe, the process, the GPU switching contexts).
It runs in a child process like any kernel file, through the same code."""


def kernel_fn(x):
    return x.clone()
