//! `shoal-group`: see `shared/DESIGN.md` section 1. Built by its own issue.
