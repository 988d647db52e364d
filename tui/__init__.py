"""The operator's Textual app. The only package that imports textual."""
