"""Each node's own history: samples of every layer kept in SQLite, rolled up by age, and the hints
read from them."""
