"""Study recipes: stage logic, run directories, method x seed comparisons, reports."""
