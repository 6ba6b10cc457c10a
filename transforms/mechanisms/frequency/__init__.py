"""Frequency oracles: GRR, OUE, OLH, linear local hashing, Hadamard response, count-mean sketch, and the
fragmented unary encodings (attribute-fragmented k-RAPPOR, report fragmenting with a backstop)."""
