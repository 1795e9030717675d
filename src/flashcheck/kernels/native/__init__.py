"""Native C routines of the simulators: the .c sources, their builder (cbuild) and the ctypes wrappers."""
