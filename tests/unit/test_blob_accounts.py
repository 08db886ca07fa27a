"""Which storage account a --url names, against the connection string's (a mismatch would open the wrong one)."""
from __future__ import annotations

import pytest

from azext_elastictrain.core.blobstore import account_name, foreign_account

AZURITE = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
           "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;")
TEST_ACCOUNT = "DefaultEndpointsProtocol=https;AccountName=testacct;AccountKey=a2V5;EndpointSuffix=core.windows.net"


@pytest.mark.parametrize("url, connection_string, expected", [
    ("https://prodacct.blob.core.windows.net/ckpt/job", AZURITE, ("prodacct", "devstoreaccount1")),
    ("https://prodacct.blob.core.windows.net/ckpt/job", TEST_ACCOUNT, ("prodacct", "testacct")),
    ("http://127.0.0.1:10000/otheracct/ckpt/job", AZURITE, ("otheracct", "devstoreaccount1")),
    ("https://prodacct.blob.core.windows.net/ckpt/job", "UseDevelopmentStorage=true",
     ("prodacct", "devstoreaccount1")),
    ("http://127.0.0.1:10000/devstoreaccount1/ckpt/job", AZURITE, None),
    ("http://127.0.0.1:10000/devstoreaccount1/ckpt/job", "UseDevelopmentStorage=true", None),
    ("https://testacct.blob.core.windows.net/ckpt/job", TEST_ACCOUNT, None),
    ("https://TestAcct.blob.core.windows.net/ckpt/job", TEST_ACCOUNT, None),
])
def test_a_url_outside_the_connection_strings_account_names_both(url, connection_string, expected) -> None:
    assert foreign_account(url, connection_string) == expected


@pytest.mark.parametrize("account_url, expected", [
    ("https://acct.blob.core.chinacloudapi.cn", "acct"),
    ("https://acct.z12.blob.storage.azure.net/", "acct"),
    ("http://127.0.0.1:10000/devstoreaccount1", "devstoreaccount1"),
])
def test_account_name_of_azure_hosts_and_azurite_paths(account_url, expected) -> None:
    assert account_name(account_url) == expected
