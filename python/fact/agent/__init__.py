"""The agent: an LLM proposes data in FACT's formats, FACT's own gates decide, and the registry
keeps what passed. Off by default: nothing here runs, and no connection is made, unless
`fact agent ...` is called.

Task so far: lowerings (fact.agent.lowering) of ATen ops the catalog lacks, as expressions over
the function vocabulary; accepted ones join GEMM epilogues and pointwise regions in every later
plan (engine/discover/lowering.h). The transport is fact.agent.client; a run, fact.agent.propose.
"""
