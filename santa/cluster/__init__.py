"""The Ray cluster: starting or joining it, what it holds (resources, placement), reaping what a job left."""
