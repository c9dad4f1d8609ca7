"""Speed and memory of every op beside what a user would otherwise run, and a GPU cost model: see README.md."""
