"""What every dialect's request is read into: the shared fields and their ranges, the
reply's form and tools, images, and the engine's request made of them (`ask`).
"""
