"""Floor 8, the chapters: each notebook's own helpers, named after the notebook.

    critical_path.py (03, 04)      zero_bubble.py (05)
    bidirectional.py (06)          recomputation.py (07)       vocabulary_parallelism.py (08)
    tensor_and_pipeline.py, tensor_and_pipeline_check.py (09b)  moe_expert_parallelism.py (10)
    async_pipelines.py (11)        planner.py (12)             write_your_own_schedule/ (13)
    papers_at_scale.py (14)        your_own_model/ (15: the LLaMA-style example stack and its helpers)
"""
