"""Benchmarks behind ``speedboard bench``: what torch.compile and gradient accumulation buy.

Run from the source checkout. Modules: ``cells`` (the matrix), ``bare_loop``
(the plain reference loop), ``hf_reference`` (Hugging Face's Llama), ``runners``
(timed runs of each), ``probe`` (one fresh process: compile seconds and peak
memory), ``report`` (JSON, Markdown, PNG) and ``run`` (the command line).
"""
