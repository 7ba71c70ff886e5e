"""pydantic wire models: request models forbid unknown fields and bound every number and string.

Nothing here imports other dlcloud modules except ``dlcloud.schemas`` itself.
"""
