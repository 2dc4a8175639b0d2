"""tensorflow.python, as far as the adapter uses it (tensorflow.python.eager.context)."""
