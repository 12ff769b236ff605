"""End to end in a real headless Chromium (Debian's package, driven by Selenium): type a document,
place the cursor with the keyboard, add a keyphrase, request an insertion, see a candidate with the
keyphrase in place, accept it and check the document; then cancel a long request."""

import os

import pytest

pytest.importorskip("fastapi")

from app_fixtures import live_server, tiny_model  # noqa: E402
from ctrlg.app import create_app  # noqa: E402
from ctrlg.app.browser import find_chromium, headless_chromium  # noqa: E402

pytestmark = pytest.mark.browser

BEFORE = "The old cat sat on the mat."
AFTER = " The dog ran in the park."


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if find_chromium() is None:
        message = "no chromium + chromedriver (apt-get install -y chromium chromium-driver)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + " — required under CI")
        pytest.skip(message)
    pytest.importorskip("selenium")
    driver = headless_chromium(str(tmp_path_factory.mktemp("chromium-profile")))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(smollm2_tokenizer):
    model, hmm = tiny_model(smollm2_tokenizer)
    with live_server(create_app(model, smollm2_tokenizer, hmm)) as base:
        yield base


def set_field(driver, element_id, text):
    field = driver.find_element("id", element_id)
    field.clear()
    field.send_keys(text)


def test_insert_a_keyphrase_and_accept_it(browser, server):
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    driver.get(server + "/")
    document = driver.find_element("id", "document")
    document.click()
    document.send_keys(BEFORE + AFTER)
    document.send_keys(Keys.LEFT * len(AFTER))          # cursor between the two sentences
    assert driver.find_element("id", "op-insert").is_selected()
    set_field(driver, "keyphrases", "bright lamp")
    set_field(driver, "max-new-tokens", "12")
    set_field(driver, "num-candidates", "3")
    driver.find_element("id", "generate").click()

    wait = WebDriverWait(driver, 90)
    wait.until(lambda d: d.find_elements("css selector", "#candidates .candidate"))
    candidates = driver.find_elements("css selector", "#candidates .candidate .text")
    texts = [c.text for c in candidates]
    assert texts and all("bright lamp" in t for t in texts), texts
    lls = driver.find_elements("css selector", "#candidates .candidate .ll")
    assert all(ll.text.startswith("log p = -") for ll in lls)
    # shown in place: the preview holds the text before, the candidate, the text after
    mark = driver.find_element("css selector", "#preview mark")
    assert mark.text.strip() == texts[0].strip() and "bright lamp" in mark.text
    raw = driver.execute_script("return shown.candidates[0].text")

    driver.find_element("css selector", "#candidates .candidate .accept").click()
    value = driver.find_element("id", "document").get_property("value")
    assert value == BEFORE + raw + AFTER and "bright lamp" in value
    assert not driver.find_elements("css selector", "#candidates .candidate")


def test_rewrite_a_selected_span(browser, server):
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    driver.get(server + "/")
    document = driver.find_element("id", "document")
    document.click()
    document.send_keys("The old cat sat on the mat. The dog ran.")
    document.send_keys(Keys.LEFT * len(". The dog ran."))
    document.send_keys(Keys.SHIFT + Keys.LEFT * len("sat on the mat"))   # select "sat on the mat"
    assert driver.find_element("id", "op-rewrite").is_selected()
    set_field(driver, "keyphrases", "green tree")
    set_field(driver, "max-new-tokens", "10")
    set_field(driver, "num-candidates", "2")
    driver.find_element("id", "generate").click()
    WebDriverWait(driver, 90).until(lambda d: d.find_elements("css selector", "#candidates .candidate"))
    assert driver.find_element("css selector", "#preview del").text == "sat on the mat"
    raw = driver.execute_script("return shown.candidates[0].text")
    assert "green tree" in raw
    driver.find_element("css selector", "#candidates .candidate .accept").click()
    assert driver.find_element("id", "document").get_property("value") == \
        "The old cat " + raw + ". The dog ran."


def test_a_long_request_can_be_cancelled(browser, server):
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    driver.get(server + "/")
    set_field(driver, "document", "The cat sat.")
    set_field(driver, "max-new-tokens", "128")
    set_field(driver, "num-candidates", "2")
    driver.find_element("id", "generate").click()
    status = driver.find_element("id", "status")
    WebDriverWait(driver, 60, poll_frequency=0.05).until(lambda d: "Generating" in status.text)
    driver.find_element("id", "cancel").click()
    WebDriverWait(driver, 30).until(lambda d: status.text == "Cancelled.")
    assert not driver.find_elements("css selector", "#candidates .candidate")
    assert driver.find_element("id", "generate").is_enabled()
