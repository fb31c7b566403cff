"""Policy, value and supervised losses per token, and how a mini-batch's token losses become one number."""
