"""Security: the ACL model, the authorizer and the ACL store (authorization; authentication lives with the listeners)."""
