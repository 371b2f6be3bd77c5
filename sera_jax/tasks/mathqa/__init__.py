"""Math word problems as an RL task.

`problems` (embedded arithmetic generator), `data` (GSM8K / MATH JSONL and Parquet loaders,
prompt templates), `grader` (answer extraction + math-verify equivalence), `task`
(`MathTask`, the `RLTask` the trainer and evaluator use).
"""
