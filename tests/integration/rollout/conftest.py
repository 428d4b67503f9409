from tests.unit.plugins.collection_path import install

install()
