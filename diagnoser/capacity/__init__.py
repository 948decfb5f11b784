"""Capacity model (docs/sglang.md#kv-sizing): KV bytes per token, the pool and memory split from the engine, what-ifs,
the decode throughput fit and the job ETA. Pure math over the timeline; rules and advice call it.

    kvbytes.py     bytes per token from a Hugging Face config (MHA/GQA, MLA, hybrid; kv dtype; pages)
    weights.py     weight bytes per rank from a config (dense, MoE, MLA, hybrid; dtype; quantization)
    gpus.py        common accelerators' usable memory and SGLang's automatic mem_fraction_static
    estimate.py    SGLang's pool formula on estimates, and the estimate beside the engine's numbers
    pool.py        pool and memory split from the engine's own numbers first
    throughput.py  decode step time vs batch, fitted where the batch varied
    eta.py         completed requests, rate and ETA
    scenario.py    Workload (what clients asked) and Scenario (what a change gives)
    whatif.py      Planner: every what-if, anchored on the observed server
    build.py       a Planner for one timeline and the CLI extras
"""
