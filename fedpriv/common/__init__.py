"""Layer 0, the leaf: errors, validation helpers, the wire keys, notices. Imports no other
fedpriv package."""
