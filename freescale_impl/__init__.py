"""FreeScale: load-balanced input samples (partition), and the rest as it arrives."""
