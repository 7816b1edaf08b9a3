"""Benchmarks behind ``speedboard bench``: what torch.compile, bf16 and gradient accumulation buy.

Run from the source checkout. Modules: ``cells`` (the matrix, of the core's
``core.trials`` cells), ``bare_loop`` (the plain reference loop),
``hf_reference`` (Hugging Face's Llama), ``runners`` (timed runs of each; the
Trainer's through ``core.trials.run_trial``, the runner of ``speedboard tune``),
``probe`` (one fresh process: compile seconds and peak memory), ``report``
(JSON, Markdown, PNG), ``run`` (the command line) and ``tune_screenshot`` (the
README's picture of the advisor).
"""
