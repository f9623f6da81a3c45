"""Sixty sentences, each naming one person's name, age, city and occupation, with those facts:
the extraction task of ``guidedec bench quality`` and of the real-model tests. Written for
guidedec (the people are invented); the phrasing varies on purpose (the age before or after
the name, in words of its own, the city early or late)."""

from __future__ import annotations

from typing import TypedDict


class Person(TypedDict):
    name: str
    age: int
    city: str
    occupation: str


EXTRACTION: list[tuple[str, Person]] = [
    (s, {"name": n, "age": a, "city": c, "occupation": o})
    for s, n, a, c, o in [
        (
            "Maria Lopez, 34, moved to Lisbon last year and works as a nurse.",
            "Maria Lopez",
            34,
            "Lisbon",
            "nurse",
        ),
        (
            "Tom Becker is a 51-year-old carpenter living in Hamburg.",
            "Tom Becker",
            51,
            "Hamburg",
            "carpenter",
        ),
        (
            "Aiko Tanaka, 27, is a software engineer in Osaka.",
            "Aiko Tanaka",
            27,
            "Osaka",
            "software engineer",
        ),
        (
            "The baker Pierre Dubois, aged 45, has a shop in Lyon.",
            "Pierre Dubois",
            45,
            "Lyon",
            "baker",
        ),
        (
            "Last week, 62-year-old farmer John Miller sold his land near Omaha.",
            "John Miller",
            62,
            "Omaha",
            "farmer",
        ),
        (
            "Lena Novak, 29, teaches history in Prague as a teacher.",
            "Lena Novak",
            29,
            "Prague",
            "teacher",
        ),
        (
            "Carlos Ruiz, a 38-year-old pilot, flies out of Madrid.",
            "Carlos Ruiz",
            38,
            "Madrid",
            "pilot",
        ),
        (
            "Priya Sharma is 41 and works as a lawyer in Mumbai.",
            "Priya Sharma",
            41,
            "Mumbai",
            "lawyer",
        ),
        (
            "In Toronto, the architect Sarah Chen turned 36 this spring.",
            "Sarah Chen",
            36,
            "Toronto",
            "architect",
        ),
        (
            "Ahmed Hassan, 55, drives a taxi in Cairo; he is a taxi driver by trade.",
            "Ahmed Hassan",
            55,
            "Cairo",
            "taxi driver",
        ),
        ("Olga Ivanova is a 47-year-old dentist from Kyiv.", "Olga Ivanova", 47, "Kyiv", "dentist"),
        (
            "Chef Marco Rossi, 33, runs the kitchen of a restaurant in Rome.",
            "Marco Rossi",
            33,
            "Rome",
            "chef",
        ),
        (
            "Emma Wilson lives in Dublin, is 24 years old and works as a journalist.",
            "Emma Wilson",
            24,
            "Dublin",
            "journalist",
        ),
        (
            "Kwame Mensah, a 39-year-old electrician, lives in Accra.",
            "Kwame Mensah",
            39,
            "Accra",
            "electrician",
        ),
        (
            "At 58, Hans Schmidt still works as a plumber in Vienna.",
            "Hans Schmidt",
            58,
            "Vienna",
            "plumber",
        ),
        (
            "Sofia Costa, 31, is a photographer based in Porto.",
            "Sofia Costa",
            31,
            "Porto",
            "photographer",
        ),
        (
            "The 44-year-old pharmacist Yusuf Demir opened a pharmacy in Izmir.",
            "Yusuf Demir",
            44,
            "Izmir",
            "pharmacist",
        ),
        (
            "Anna Kowalski works as an accountant in Warsaw; she is 35.",
            "Anna Kowalski",
            35,
            "Warsaw",
            "accountant",
        ),
        (
            "Diego Fernandez, 26, plays the violin for an orchestra in Buenos Aires as a musician.",
            "Diego Fernandez",
            26,
            "Buenos Aires",
            "musician",
        ),
        (
            "Grace Okafor, 42, is a surgeon at a hospital in Lagos.",
            "Grace Okafor",
            42,
            "Lagos",
            "surgeon",
        ),
        (
            "Lars Nilsson, a 60-year-old fisherman, sails from Bergen.",
            "Lars Nilsson",
            60,
            "Bergen",
            "fisherman",
        ),
        (
            "Mei Lin is 23 and studies in Shanghai as a student.",
            "Mei Lin",
            23,
            "Shanghai",
            "student",
        ),
        (
            "Robert Brown, 49, has worked as a mechanic in Detroit for twenty years.",
            "Robert Brown",
            49,
            "Detroit",
            "mechanic",
        ),
        (
            "Fatima Zahra, a 30-year-old nurse, lives in Casablanca.",
            "Fatima Zahra",
            30,
            "Casablanca",
            "nurse",
        ),
        (
            "Jonas Weber is a 28-year-old programmer in Berlin.",
            "Jonas Weber",
            28,
            "Berlin",
            "programmer",
        ),
        (
            "Isabel Garcia, 52, teaches mathematics in Seville as a teacher.",
            "Isabel Garcia",
            52,
            "Seville",
            "teacher",
        ),
        (
            "The firefighter Liam Murphy, 37, serves in Boston.",
            "Liam Murphy",
            37,
            "Boston",
            "firefighter",
        ),
        (
            "Nadia Petrova, 45, is an engineer at a plant in Sofia.",
            "Nadia Petrova",
            45,
            "Sofia",
            "engineer",
        ),
        (
            "Kenji Watanabe, 66, a retired banker, lives in Kyoto.",
            "Kenji Watanabe",
            66,
            "Kyoto",
            "banker",
        ),
        (
            "Chloe Martin is a 25-year-old designer from Paris.",
            "Chloe Martin",
            25,
            "Paris",
            "designer",
        ),
        (
            "Samuel Cohen, 40, practises as a doctor in Jerusalem.",
            "Samuel Cohen",
            40,
            "Jerusalem",
            "doctor",
        ),
        (
            "Elena Popescu, a 33-year-old translator, moved to Bucharest.",
            "Elena Popescu",
            33,
            "Bucharest",
            "translator",
        ),
        ("Mohammed Ali, 29, works as a waiter in Dubai.", "Mohammed Ali", 29, "Dubai", "waiter"),
        (
            "Hannah Schulz is 50 and owns a bakery in Munich as a baker.",
            "Hannah Schulz",
            50,
            "Munich",
            "baker",
        ),
        (
            "Pedro Santos, 46, a bus driver, lives in Sao Paulo.",
            "Pedro Santos",
            46,
            "Sao Paulo",
            "bus driver",
        ),
        (
            "Julia Andersson, 32, is a veterinarian in Stockholm.",
            "Julia Andersson",
            32,
            "Stockholm",
            "veterinarian",
        ),
        (
            "Rahul Gupta, a 27-year-old data scientist, works in Bangalore.",
            "Rahul Gupta",
            27,
            "Bangalore",
            "data scientist",
        ),
        (
            "Amelia Clark, 61, still works as a librarian in Edinburgh.",
            "Amelia Clark",
            61,
            "Edinburgh",
            "librarian",
        ),
        (
            "Viktor Horvat is a 43-year-old police officer in Zagreb.",
            "Viktor Horvat",
            43,
            "Zagreb",
            "police officer",
        ),
        ("Laura Bianchi, 22, is a barista in Milan.", "Laura Bianchi", 22, "Milan", "barista"),
        ("Daniel Kim, 34, works as an architect in Seoul.", "Daniel Kim", 34, "Seoul", "architect"),
        (
            "Zanele Dlamini is a 39-year-old teacher in Durban.",
            "Zanele Dlamini",
            39,
            "Durban",
            "teacher",
        ),
        ("Mateo Silva, 31, a chef, cooks in Lima.", "Mateo Silva", 31, "Lima", "chef"),
        ("Ingrid Berg, 57, is a judge in Oslo.", "Ingrid Berg", 57, "Oslo", "judge"),
        (
            "Thomas Dupont, a 48-year-old butcher, has a shop in Brussels.",
            "Thomas Dupont",
            48,
            "Brussels",
            "butcher",
        ),
        (
            "Leila Karimi is 26 and works as a nurse in Tehran.",
            "Leila Karimi",
            26,
            "Tehran",
            "nurse",
        ),
        (
            "George Papadopoulos, 53, is a fisherman from Athens.",
            "George Papadopoulos",
            53,
            "Athens",
            "fisherman",
        ),
        (
            "Chen Wei, 35, works as an accountant in Beijing.",
            "Chen Wei",
            35,
            "Beijing",
            "accountant",
        ),
        (
            "Lucy Evans, a 29-year-old nurse, lives in Cardiff.",
            "Lucy Evans",
            29,
            "Cardiff",
            "nurse",
        ),
        (
            "Miguel Torres is a 64-year-old farmer near Valencia.",
            "Miguel Torres",
            64,
            "Valencia",
            "farmer",
        ),
        ("Eva Horakova, 38, is a pharmacist in Brno.", "Eva Horakova", 38, "Brno", "pharmacist"),
        (
            "Oscar Lindqvist, 21, works as a cashier in Gothenburg.",
            "Oscar Lindqvist",
            21,
            "Gothenburg",
            "cashier",
        ),
        ("Amina Yusuf is a 44-year-old lawyer in Nairobi.", "Amina Yusuf", 44, "Nairobi", "lawyer"),
        (
            "Patrick O'Brien, 59, is a carpenter in Cork.",
            "Patrick O'Brien",
            59,
            "Cork",
            "carpenter",
        ),
        (
            "Yuki Sato, a 30-year-old photographer, lives in Tokyo.",
            "Yuki Sato",
            30,
            "Tokyo",
            "photographer",
        ),
        (
            "Ana Pereira, 41, works as a dentist in Rio de Janeiro.",
            "Ana Pereira",
            41,
            "Rio de Janeiro",
            "dentist",
        ),
        (
            "Michael Johnson is a 36-year-old pilot based in Chicago.",
            "Michael Johnson",
            36,
            "Chicago",
            "pilot",
        ),
        ("Sara Haddad, 27, is a journalist in Beirut.", "Sara Haddad", 27, "Beirut", "journalist"),
        (
            "Nikolai Smirnov, 50, works as an engineer in Moscow.",
            "Nikolai Smirnov",
            50,
            "Moscow",
            "engineer",
        ),
        (
            "Clara Jensen, a 33-year-old doctor, works in Copenhagen.",
            "Clara Jensen",
            33,
            "Copenhagen",
            "doctor",
        ),
    ]
]
"""(sentence, its facts)."""

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "occupation": {"type": "string"},
    },
    "required": ["name", "age", "city", "occupation"],
    "additionalProperties": False,
}
"""The JSON schema of one person's record."""
FIELDS = ("name", "age", "city", "occupation")


def instruction(sentence: str) -> str:
    """The user message asking for the record of ``sentence``."""
    return (
        "Extract the person's name, age, city and occupation from this sentence as JSON with "
        f'the keys "name", "age", "city" and "occupation": {sentence}'
    )
