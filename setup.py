"""fedpersonal: personalized, partially local federated learning on TensorFlow Federated."""

import setuptools

setuptools.setup(
    name='fedpersonal',
    version='0.1.0',
    description=('Partially local federated learning (FedRecon, FURL, HPFL, FedDVA) on TensorFlow Federated.'),
    packages=setuptools.find_packages(include=['fedpersonal', 'fedpersonal.*']),
    python_requires='>=3.11,<3.12',
    install_requires=[
        # jax/jaxlib must be overridden to 0.4.13: see requirements/overrides.txt and scripts/env.sh.
        'tensorflow-federated==0.87.0',
        'absl-py',
        'matplotlib',
        'pandas',
        'tensorflow-datasets',
    ],
)
